"""Command-line entry points (console scripts): each module has main(argv) -> int; tools/*.py call them."""
