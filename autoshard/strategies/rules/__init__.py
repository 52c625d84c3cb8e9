"""Sharding rules, one module per op family; each registers its rules with ``@register`` on import.

See :mod:`autoshard.strategies` for the tour and :mod:`autoshard.strategies.registry` for the rule contract.
"""
