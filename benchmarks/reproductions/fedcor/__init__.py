"""FedCor (Tang et al., CVPR 2022): Table 1 on Fashion-MNIST and the diagnostics of its Gaussian process."""
