"""``goodput drill``: a user's script run through every infrastructure fault goodput claims to survive.

:mod:`goodput.drill.scenario` holds the contract (a :class:`~goodput.drill.scenario.Scenario` is a name, what
it injects, its documented outcome and a ``run(context)``); :mod:`goodput.drill.catalog` lists the scenarios.
"""
