package watch

import (
	"context"
	"net/http"

	"github.com/watchsan/watchsan/internal/reqinfo"
	"github.com/watchsan/watchsan/internal/review"
	"github.com/watchsan/watchsan/internal/upstream"
)

// What an access review (package review, docs/design.md section 11) means for a watch: a
// client with its own credentials shares a feed only when the apiserver allowed it; else it
// goes to a private feed, counted by why.

// reviewClientGone is what review says when the watch's client left before its answer: not a
// PrivateFeedReasons value (nothing is served, nothing counted).
const reviewClientGone = "client-gone"

// DefaultShareReviewEntries bounds the denied-review cache (--share-access-review-cache-entries).
const DefaultShareReviewEntries = review.DefaultEntries

// review says whether the client of the watch r, with cred, may share a feed: "" when the
// apiserver allowed it, by a review that began after r arrived; else why not (a
// PrivateFeedReasons value, or reviewClientGone). It waits at most for two reviews, and not
// after r's client left.
func (h *Handler) review(r *http.Request, info *reqinfo.Info, cred upstream.Credentials, ck review.CredKey) string {
	return h.reviewVerb(r.Context(), r, info, cred, ck, "watch")
}

// reviewVerb is review for verb on r's scope (an absorb asks for list, share_state.go),
// waiting for the answer until ctx ends.
func (h *Handler) reviewVerb(ctx context.Context, r *http.Request, info *reqinfo.Info, cred upstream.Credentials, ck review.CredKey, verb string) string {
	switch h.reviews.Review(ctx, r, info, cred, ck, verb) {
	case review.Allowed:
		return ""
	case review.ClientGone:
		return reviewClientGone
	case review.Failed:
		return privateReviewFailed
	}
	return privateDenied
}

// ReviewList says whether the apiserver allows the client of the list r (classified as info,
// going with cred) to list its scope: an access review with its own credentials, begun after r
// arrived and coalesced with identical ones as a watch's are (package coalesce then lets it
// share a list with the other identities allowed it, docs/design.md section 18). False for
// credentials that are not reviewed (review.NeedsReview: the lent identity, anonymous), on any
// answer but allowed, and when the client left before the answer.
func (h *Handler) ReviewList(r *http.Request, info *reqinfo.Info, cred upstream.Credentials) bool {
	return review.NeedsReview(cred) && h.reviewVerb(r.Context(), r, info, cred, review.CredentialsKey(r, cred), "list") == ""
}
