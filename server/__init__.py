"""torchbay.server."""
