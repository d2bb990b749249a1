
	mnist-mlp2mnist8