"""Rented machines: one adapter per provider behind one small interface, the inventory of a pass,
and checkpoints copied off a rental while its run trains, so a vanished rental loses nothing."""
