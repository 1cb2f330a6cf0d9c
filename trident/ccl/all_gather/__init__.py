"""All-gather algorithms, one per file, each declared in trident/ccl/registry.py."""
