"""The command line: `convergerd COMMAND` and its subcommands."""
