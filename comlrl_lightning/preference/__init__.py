"""The preference family (opt-in): learning from winner/loser pairs of joint actions.

- MADPO (:mod:`.madpo`: joint DPO, :mod:`.dpo` its loss) and MARLHF (:mod:`.marlhf`: a joint reward
  model, :mod:`.joint_reward_model` and :mod:`.reward_model_folder`, then RL), one-shot;
- their iterative forms (:mod:`.madpo_iter`, :mod:`.marlhf_iter`, the round loop :mod:`.round_loop`)
  against a comparator (:mod:`.comparator`) with replay of earlier rounds' pairs (:mod:`.replay`);
- the pairs: built from a rollout (:mod:`.selection`), read from a file or built for MARLHF
  (:mod:`.pair_source`), their records (:mod:`.pairs`) and batches (:mod:`.pair_batch`).

Nothing in the core imports this package (``tests/test_structure.py``); ``docs/preference.md`` and
``docs/iterative.md`` describe it.
"""
