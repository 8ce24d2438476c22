"""The floor the retrieve pipeline stands on: the call and its typed parts, the pluggable steps'
interfaces, the rankers' features and the document visibility rule.

Nothing here imports a layer, a source, the engine, a front end or a store implementation, so that
layers and sources can share these types without importing each other (docs/architecture.md).
"""
