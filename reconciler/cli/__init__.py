"""The command line: parse arguments, call the rooms below, print, choose the exit code."""
