"""banditstream: the SDK services import, the CLI, configuration and the embedded stack.

    from banditstream import Decider
"""

from banditstream.decider import ActivePolicy, Decider, Decision, PulledSnapshots

__all__ = ["ActivePolicy", "Decider", "Decision", "PulledSnapshots"]
