"""The length-coordination toy task (two tiny agents learn on CPU in minutes): its rows and rewards
(:mod:`.env`) and its DataModule (:mod:`.datamodule`, public as
``comlrl_lightning.datamodules.LengthRatioDataModule``)."""
