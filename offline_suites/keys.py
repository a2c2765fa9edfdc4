"""Every Redis key this package writes, in one place, under one prefix.

arq keeps its own bookkeeping keys in its fixed ``arq:`` namespace (``arq:job:<id>``,
``arq:in-progress:<id>``, ``arq:retry:<id>``) and those prefixes are module constants in arq, not
options. To keep *all* keys of one deployment findable (and a test run removable) we make every
arq job id start with our prefix, so ``arq:*:<prefix>*`` plus ``<prefix>*`` is the complete set.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "nextguard:suites:"

    @property
    def queue(self) -> str:
        """arq queue (sorted set of job ids)."""
        return f"{self.prefix}queue"

    @property
    def runs_index(self) -> str:
        """Sorted set: run id scored by creation time, for ``GET /v1/runs``."""
        return f"{self.prefix}runs"

    def run(self, run_id: str) -> str:
        """JSON record of one suite run (status, progress, result)."""
        return f"{self.prefix}run:{run_id}"

    def cancel(self, run_id: str) -> str:
        """Set when a cancel was requested; the worker polls it."""
        return f"{self.prefix}cancel:{run_id}"

    def job_id(self, run_id: str) -> str:
        """arq job id for a run: carries the prefix (see module docstring)."""
        return f"{self.prefix}job:{run_id}"

    @property
    def batches_index(self) -> str:
        return f"{self.prefix}batches"

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}batch:{batch_id}"

    def file(self, file_id: str) -> str:
        """JSON metadata of an uploaded/produced file (bytes live in the results dir)."""
        return f"{self.prefix}file:{file_id}"

    def tenant_files(self, tenant: str) -> str:
        """Hash: the tenant's uploaded file ids -> bytes (upload quota)."""
        return f"{self.prefix}quota:files:{tenant}"

    def tenant_jobs(self, tenant: str) -> str:
        """Sorted set: the tenant's queued or running runs and batches (submission quota)."""
        return f"{self.prefix}quota:jobs:{tenant}"

    def batch_tenant(self, batch_id: str) -> str:
        """The tenant a batch was submitted by: its lines run as that tenant."""
        return f"{self.prefix}batch-tenant:{batch_id}"

    @property
    def health_check(self) -> str:
        return f"{self.prefix}health-check"

    def patterns(self) -> list[str]:
        """Glob patterns that together match every key of this prefix (for cleanup)."""
        return [f"{self.prefix}*", f"arq:*:{self.prefix}*"]
