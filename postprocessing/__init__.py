"""Post-processors of sentence embeddings, each fitted on a named corpus whose label travels with its scores."""

from promptemb.postprocessing.base import PostProcessor
from promptemb.postprocessing.registry import POST_NAMES, build_post, build_posts

__all__ = ["POST_NAMES", "PostProcessor", "build_post", "build_posts"]
