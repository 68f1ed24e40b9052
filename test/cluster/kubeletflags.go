package cluster

// kubeletClientFlags make the apiservers verify a kubelet's serving certificate against the
// cluster CA and present the admin client certificate to it, so that the stand-in kubelet
// (package kubelet) can serve with ServingCertFile and require a client certificate.
func (c *Cluster) kubeletClientFlags() []string {
	return []string{
		"--kubelet-certificate-authority=" + c.pki.caPath,
		"--kubelet-client-certificate=" + c.pki.adminCert,
		"--kubelet-client-key=" + c.pki.adminKey,
	}
}
