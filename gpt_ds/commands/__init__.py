"""Command-line entry points: each module has main(argv) -> int; tools/*.py call them."""
