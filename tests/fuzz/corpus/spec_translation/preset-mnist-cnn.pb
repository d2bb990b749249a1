
	mnist-cnn2mnist8H