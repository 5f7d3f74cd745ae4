"""What the model predicts on the probe's windows, beside the geometry (issue 39): `lm_loss`
(the loss and bits per character rows, from the model's own head) and `tokens` (each probed
state's surprisal and local intrinsic dimension, and their correlation per step and layer)."""
