"""One reconcile pass: observe every machine, plan, apply the plan's changes with bounded
concurrency, summarize, commit. Level-triggered: each pass looks at the whole world again."""
