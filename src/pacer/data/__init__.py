"""Packaged text corpora read by pacer (not benchmark questions: those are :mod:`pacer.bench.data`)."""
