"""CLI commands, one module each: `add_parser(sub)` adds the subcommand and sets `fn`, a
function `fn(args) -> int` that raises NpurunError on bad input (the CLI prints it)."""
