"""torchbay.benchmarks."""
