"""The chaos harness: two services and their jobs under faults, as real processes.

``python -m tests.chaos --help`` lists the knobs; ``tests.chaos.harness`` says what
runs and what is checked.
"""
