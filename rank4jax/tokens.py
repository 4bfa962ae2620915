"""The special token ids of SPEC §1, the one definition shared by the data layer and the models."""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")  # their strings, in id order
