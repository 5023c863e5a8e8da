"""How a run goes, whatever hosts it: the `Control` protocol both tiers implement (real
processes or containers in harness/backends/, the simulator's world in harness/sim/),
the injector that applies a fault schedule through it, the run loop, and the result a
run leaves (summary.json). Neither tier imports the other; both import this."""
