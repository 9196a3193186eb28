"""What a run is made of and what it makes: the bundle built on the control plane, code pinned at a
commit, files copied back from machines without following a link, and the provenance manifest."""
