// Package review is the access-review cache (docs/design.md section 11, "Who shares with
// whom"): whether the apiserver allows a client, with its own credentials, to watch (or list)
// exactly a scope, asked by a SelfSubjectAccessReview sent with those credentials through the
// Attempter, identical reviews coalesced and recent denials kept.
//
// It owns the reviews in flight and the denied-review cache (Cache), the keys they are kept by
// (CredentialsKey, a digest: never a credential in clear) and the rule of which credentials are
// reviewed at all (NeedsReview). What a verdict means for a watch (a shared or a private feed)
// is its caller's.
//
// It may import internal/reqinfo and internal/upstream (credentials, the Attempter), and
// nothing of the watch layer (internal/watch, internal/server): they import it.
package review
