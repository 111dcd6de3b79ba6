"""The pure core: policies and their validation, the Policy object, what to apply, what happened,
error classes, decoding of what comes from outside, row types. Imports no I/O library."""
