"""torchbay.handlers."""
