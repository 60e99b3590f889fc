"""Math rewards for rlcore: GSM8K accuracy and format, math-verify accuracy, cosine, repetition, soft overlong."""
