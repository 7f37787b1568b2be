"""Lightning callbacks: STS evaluation during and after training."""
