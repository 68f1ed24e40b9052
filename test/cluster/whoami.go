package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// WhoAmI asks the apiserver at url (or a proxy in front of it), with hc, who a request with the
// headers h is, by a SelfSubjectReview: the status code, and for a 201 the user and its groups,
// sorted. An error means no answer could be read.
func WhoAmI(hc *http.Client, url string, h http.Header) (code int, user string, groups []string, err error) {
	req, err := http.NewRequest(http.MethodPost, url+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, "", nil, nil
	}
	var r struct {
		Status struct {
			UserInfo struct {
				Username string
				Groups   []string
			}
		}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&r); err != nil {
		return resp.StatusCode, "", nil, fmt.Errorf("selfsubjectreview: %w", err)
	}
	groups = r.Status.UserInfo.Groups
	slices.Sort(groups)
	return resp.StatusCode, r.Status.UserInfo.Username, groups, nil
}
