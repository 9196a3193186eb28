"""Files shipped inside bundles and run on the execution plane (standard library only)."""
