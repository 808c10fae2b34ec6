"""Stage 4: drop-ins for other frameworks (each imports its framework lazily, only when used)."""
