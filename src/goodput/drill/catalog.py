"""Every scenario of the drill, in the order the table shows them: importing a module registers its scenarios.

Add a module of scenarios with one import line in its block below (each module calls
:func:`goodput.drill.scenario.register` for each of its scenarios at import).
"""

# isort: off  (the order of the imports is the drill's order)

# process scenarios: rank, agent, launcher, preempt, hang

# storage and node scenarios: storage-full, storage-slow, throttled, flaky, node

# numeric and straggler scenarios: nan, spike, bitflip, slow
