"""Benchmark scenarios behind ``goodput bench``: each module has ``add_arguments(parser)`` and ``run(args)``.

Every scenario prints ratios against a baseline or a physical floor measured in the same run.
"""
