"""Research drivers built on the project's Encoder, poolers and scorers: template search, layer sweeps, [MASK]
predictions and the static-token bias analysis. Each module is one concept with a `main()` entry point."""
