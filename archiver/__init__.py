"""torchbay.archiver."""
