"""The command line: `petl-nas` and its commands, `doctor` and the quickstart."""
