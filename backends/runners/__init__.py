"""Runners: the code a rule's ``runner:`` names, one protocol for all (see `backends.runners.base`).

Each module imports its library only when a runner is prepared, so listing or validating them needs no GPU
package: emulation (any device), triton_moe (this project's kernels), humming (humming-kernels), oai_triton
(OpenAI triton_kernels).
"""

from backends.runners.base import Routing, Runner, RunnerFactory, RunnerSpec, RunnerUnavailableError

__all__ = ["Routing", "Runner", "RunnerFactory", "RunnerSpec", "RunnerUnavailableError"]
