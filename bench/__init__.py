"""The project's benchmarks, grouped by job. Each script runs from the repository root as a module,
`python -m bench.<group>.<script>`.

serving/   the TTFT harness over HTTP and the checks that drive a running server
replay/    CPU replays through the installed SGLang's own scheduler and radix cache
ops/       the block-sparse operators on one GPU
accuracy/  sparse vs dense predictions and answers of a real model
lib/       what scripts of several groups use: the HTTP client, real text, the run/compare command
           line, percentiles
gpu/       the GPU host's shell drivers and their recipe (gpu/README.md)
results/   the runs' evidence, indexed by RESULTS.md; models/, baselines/: data
"""
