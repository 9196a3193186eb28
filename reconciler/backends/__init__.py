"""Backends by key ``<placement>_<launch_mode>``: the only thing that selects one."""
