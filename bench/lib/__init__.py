"""What benchmark scripts of several groups share."""
