"""The LightningModules: MAGRPO and its relatives."""
