"""HCSFed (Song et al.): Table 1 on Fashion-MNIST, in the base and the calibrated setting."""
