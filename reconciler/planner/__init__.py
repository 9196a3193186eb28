"""The planner: desired state, observed state and previous status in, a plan out. Pure: it never
touches a machine, a process, git or a file, so every decision can be tested from a table of cases."""
