"""Developer checks of the measurement, outside the product's entry points: the sweep against ``vllm bench serve`` run
by hand (:mod:`tools.bench.fidelity`) and the tables of finished GPU grids (:mod:`tools.bench.bench_gpu`)."""
