"""``mqa bench``'s parts: workloads (setup / run / verify), timing, the report and its plot.

Kept out of the CLI module so that the pieces can be driven from a script or a notebook too.
"""
