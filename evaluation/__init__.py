"""Evaluators: STS scoring (SentEval 'all' protocol) and the results report."""
