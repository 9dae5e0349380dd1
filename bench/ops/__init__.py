"""The block-sparse operators timed on one GPU."""
