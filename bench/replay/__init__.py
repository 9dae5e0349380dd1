"""CPU replays through the installed SGLang's own scheduler and radix cache, and readers of their output."""
