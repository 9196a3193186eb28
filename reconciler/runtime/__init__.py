"""Files shipped to the execution plane and run there with the standard library only.

The launch wrapper, the precheck and the GPU sampler travel inside bundles as single files. The
machine agent is several modules of this package (``AGENT_MODULES``, each after those it imports,
importing one another relatively); the SSH transport sends them as one program that rebuilds them as
a package from their sources (``reconciler/machines/remote_agent.py``), and this machine imports them
as they are.
"""

AGENT_MODULES = ("gpus", "readings", "slurm_end", "slurm", "stop", "probe", "resident")
