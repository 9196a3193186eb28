"""Machines reached for a pass: transports (this machine, SSH, a Slurm login host) and launch modes on
top of them. Backends are selected by the key ``<placement>_<launch_mode>`` and by nothing else."""
