"""Benchmarks: ``make bench`` runs every registered benchmark and writes bench/results.json."""
