"""impl.gdpo inside real trainers, one opt-in module per framework (docs/integrations.md);
``import impl`` imports none of them."""
