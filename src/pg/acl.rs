//! Roles and privileges as the server sees them: who called, whose privileges a
//! role has, what it may select, whether row security applies to it.

use pgrx::pg_sys;
/// An object identifier (a role's, a relation's), for the layers above.
pub use pgrx::pg_sys::Oid;
use std::ffi::CStr;

/// The role that called the extension's function: `SECURITY DEFINER` switches the
/// current user to the function's owner, not this one (it follows `SET ROLE`).
pub fn caller() -> Oid {
    // SAFETY: GetOuterUserId only reads backend state.
    unsafe { pg_sys::GetOuterUserId() }
}

/// Whether `member` has the privileges of `role` (is it, a member of it, or a
/// superuser).
pub fn has_privileges_of(member: Oid, role: Oid) -> bool {
    // SAFETY: has_privs_of_role only reads the role membership caches.
    unsafe { pg_sys::has_privs_of_role(member, role) }
}

/// Name of a role, for messages.
pub fn role_name(role: Oid) -> String {
    // SAFETY: with noerr = true an unknown oid gives NULL; the name is a palloc'd
    // copy, read at once.
    unsafe {
        let name = pg_sys::GetUserNameFromId(role, true);
        if name.is_null() {
            format!("with oid {}", role.to_u32())
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

/// Whether `user` may SELECT from relation `relid` (any oid; false when it does
/// not exist).
pub fn may_select(relid: Oid, user: Oid) -> bool {
    // SAFETY: pg_class_aclcheck looks the relation up in the syscache and
    // reports (does not raise) what the user may do.
    unsafe {
        pg_sys::pg_class_aclcheck(relid, user, pg_sys::ACL_SELECT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Whether `user` may SELECT column `column` of relation `relid` (false when
/// either does not exist).
pub fn may_select_column(relid: Oid, column: &CStr, user: Oid) -> bool {
    // SAFETY: get_attnum returns InvalidAttrNumber (0) for a column that does not
    // exist; pg_attribute_aclcheck reports (does not raise) what the user may do.
    unsafe {
        let attnum = pg_sys::get_attnum(relid, column.as_ptr());
        attnum > 0
            && pg_sys::pg_attribute_aclcheck(
                relid,
                attnum,
                user,
                pg_sys::ACL_SELECT as pg_sys::AclMode,
            ) == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Whether `user` may SELECT at least one column of relation `relid`.
pub fn may_select_some_column(relid: Oid, user: Oid) -> bool {
    // SAFETY: pg_attribute_aclcheck_all reports (does not raise) what the user may
    // do; any oid is accepted.
    unsafe {
        pg_sys::pg_attribute_aclcheck_all(
            relid,
            user,
            pg_sys::ACL_SELECT as pg_sys::AclMode,
            pg_sys::AclMaskHow::ACLMASK_ANY,
        ) == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Whether row-level security applies to `role` reading relation `relid`.
pub fn row_security_applies(relid: Oid, role: Oid) -> bool {
    // SAFETY: check_enable_rls reads the relation's row-security flags and the
    // role's attributes; with noError it raises nothing.
    let enabled = unsafe { pg_sys::check_enable_rls(relid, role, true) };
    enabled == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32
}

/// What identifies the current statement for a privilege check made once per
/// statement: the user, the local transaction, the command and the statement's
/// start. The statement start changes with every statement a client sends (the
/// command id only after a write), so a transaction that only reads is checked
/// again at each statement and sees a revoke committed since.
pub type Statement = (Oid, u32, u32, pg_sys::TimestampTz);

/// The current [`Statement`].
pub fn statement() -> Statement {
    // SAFETY: reads this backend's user, transaction, command and statement
    // start; MyProc is valid for the backend's life.
    unsafe {
        (
            pg_sys::GetUserId(),
            crate::pg::compat::my_local_xid(),
            pg_sys::GetCurrentCommandId(false),
            pg_sys::GetCurrentStatementStartTimestamp(),
        )
    }
}

/// The role a background worker acts as in its transactions ([`act_as`]);
/// InvalidOid (0) for none. Per process: only worker processes set it.
static ACTING_ROLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// For a background worker, outside any transaction: from now on, each
/// transaction it runs through `worker::in_own_transaction` acts as `role`, as a
/// `SECURITY DEFINER` function acts as its owner ([`enter_acting_role`]).
///
/// Not by switching the user once for the whole process: Postgres wants every
/// top-level transaction to start with no security context (an assertion in
/// `StartTransaction`), so the switch is made inside each transaction and undone
/// before it commits; an abort undoes it by itself.
pub fn act_as(role: Oid) {
    ACTING_ROLE.store(role.to_u32(), std::sync::atomic::Ordering::Relaxed);
}

/// The user and security context a transaction had before
/// [`enter_acting_role`] switched them.
pub struct Switched(Oid, i32);

/// Inside a transaction just started: switches to the role of [`act_as`], if
/// any (SECURITY_LOCAL_USERID_CHANGE keeps SET ROLE from undoing it); `None`
/// when there is none.
pub fn enter_acting_role() -> Option<Switched> {
    let role = Oid::from(ACTING_ROLE.load(std::sync::atomic::Ordering::Relaxed));
    if role == pg_sys::InvalidOid {
        return None;
    }
    let mut user = pg_sys::InvalidOid;
    let mut context = 0;
    // SAFETY: reads and sets the current user inside a transaction, which
    // saved the user it started with and restores it if it aborts.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(role, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
    }
    Some(Switched(user, context))
}

/// Before the transaction of [`enter_acting_role`] commits: back to the user
/// and context it started with.
pub fn leave_acting_role(switched: Option<Switched>) {
    if let Some(Switched(user, context)) = switched {
        // SAFETY: restores what enter_acting_role read in this transaction.
        unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    }
}
